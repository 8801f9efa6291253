"""The mirror's own work: fetching model repositories from a hub into the directory it serves."""
