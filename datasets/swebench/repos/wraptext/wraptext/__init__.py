"""Greedy text wrapping."""

from .wrap import dedent_lines, fill, fill_paragraphs, shorten, wrap

__all__ = ["dedent_lines", "fill", "fill_paragraphs", "shorten", "wrap"]
