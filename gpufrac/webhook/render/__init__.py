"""The edge that renders the webhook's decisions as Kubernetes objects: the ValidatingAdmissionPolicies (and their
Bindings) generated from the rule table, as plain YAML or as the chart's template."""
