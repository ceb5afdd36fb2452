"""Charts and widgets of the notebooks, one module per finding id."""
