"""The cluster layer: cluster files, links, routing decisions, the served router and launcher."""
