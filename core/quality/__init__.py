"""The quality loop: the nightly judge, quality issues, replay cases and shadow detectors."""
