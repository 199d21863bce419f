"""Planner: from component profiles to an optimal deployment plan (000 §4, §5.3, Appendices A–C)."""
