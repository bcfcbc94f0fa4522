"""Drafter weights: formats, loaders and savers (EAGLE-1/2 head, EAGLE-3 head, Medusa heads, SpS draft
model), the checkpoint helpers they share, and random models at published shapes. Imports only ``core``."""
