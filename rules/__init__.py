"""saturn.rules: the rewrite rules, as .egg files."""
