"""Modal screens: key help and the composed config."""
