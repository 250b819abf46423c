"""saturn.eqsat: the e-graph compiler core (torch-free)."""
