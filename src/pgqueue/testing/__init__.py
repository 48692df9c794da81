"""Helpers for testing applications that use pgqueue."""

from __future__ import annotations
