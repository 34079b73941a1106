"""Presentation: text tables, verdict sentences and the HTML report, from results (no measuring here)."""
