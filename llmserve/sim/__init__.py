"""Capacity simulator: replay traffic through llmserve's own admission, balancing and
scaling code over modelled engine instances, and compare cost against SLO."""
