"""The turn loop for text: rounds, budget, repeat suppression, staged writes, recovery and repair."""
