"""Rule sets, one module per family of fusions."""
