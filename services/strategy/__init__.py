"""The strategy selector: picks the cheapest safe strategy for a recovery and records why."""
