"""Timing audits: black-box response-cache and tenant-isolation detectors over timed HTTP answers, and the
capacity gate's verdicts that a moving machine cannot fool."""
