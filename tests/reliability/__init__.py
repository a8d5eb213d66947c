"""Reliability: crashes, restarts, lost connections and bad input lose nothing (issue 9)."""
