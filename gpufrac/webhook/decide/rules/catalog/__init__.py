"""One module per rule, each holding its `RULE` (docs/architecture.md, "One rule, one module"): adding a rule is
adding a module here; `rules.table` finds it and puts it in its place by its phase and rank."""
