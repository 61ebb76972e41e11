"""Optional integrations with other libraries. Each submodule imports its library on use, so
importing faste_mm never imports them (install the extra: `pip install faste-mm[st]`)."""
