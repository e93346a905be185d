"""Files people write: YAML reading with clear errors and the budget-tree file."""
