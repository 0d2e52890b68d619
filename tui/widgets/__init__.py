"""One module per widget: answer (token view), legend, stats panel, turns."""
