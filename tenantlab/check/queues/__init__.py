"""One adapter per queue the kit knows (each module has ``rows()``: its default and recommended rows)."""
