"""The rule table (`table`): every rule the validating webhook applies, and where it runs (docs/architecture.md,
"Which rule runs where"), with the CEL that carries it in the ValidatingAdmissionPolicies.

Pure. One module per rule in `catalog/` (its Python check, its CEL and its messages); what they share: `rule` (what a
rule is), `context` (what each phase's checks read), `values` (the CEL of each annotation value), `variables` (the
policies' per-container view and settings), `parts` (pieces several rules use, in CEL and in Python), `table` (the
rules, in order, and `run`, which the webhook calls for each phase).
"""

from gpufrac.webhook.decide.rules.rule import Phase, Rule, Scope
from gpufrac.webhook.decide.rules.table import MODULES, RULES
from gpufrac.webhook.decide.rules.values import MODES
from gpufrac.webhook.decide.rules.variables import SETTINGS, VARIABLES

__all__ = ["MODES", "MODULES", "RULES", "SETTINGS", "VARIABLES", "Phase", "Rule", "Scope"]
