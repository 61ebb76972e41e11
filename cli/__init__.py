"""faste_mm.cli: the faste-mm command line."""
