"""Rendering: stats tables, heat maps, the live dashboard, trace export."""
