"""The cluster layer: cluster files, routing decisions, the served router and launcher."""
