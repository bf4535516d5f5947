"""The rule table (`table`): every rule the validating webhook applies, and where it runs (docs/architecture.md,
"Which rule runs where"), with the CEL that carries it in the ValidatingAdmissionPolicies.

Pure. One module per part: `values` (the CEL of each annotation value's rule), `variables` (the policies' shared
per-container view and settings), `pod_values`, `authorship` and `boundaries` (the CEL of the rules of
`fractions.rules` and of `validation`), `table` (the rows).
"""

from gpufrac.webhook.decide.rules.table import RULES, Rule, Scope
from gpufrac.webhook.decide.rules.values import MODES
from gpufrac.webhook.decide.rules.variables import SETTINGS, VARIABLES

__all__ = ["MODES", "RULES", "SETTINGS", "VARIABLES", "Rule", "Scope"]
