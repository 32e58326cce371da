"""Helpers and shared schemas every layer may import (atomic file writes, JSON Lines reading,
the one metrics module): nothing here imports `harness`, `server`, `predictor`, `eval` or
`cluster`, so the arrows between those keep pointing down."""
