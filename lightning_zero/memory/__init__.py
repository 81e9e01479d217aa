"""Memory: what a rank holds (footprint), what a layout needs (states), activations (probe), budgets, the plan,
and zero_auto's search. See docs/auto-fit.md."""
