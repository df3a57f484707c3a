"""The live fidelity harness: a trace through a real ``llmserve serve`` and through the
simulator, and the HTTP calibration measurements, compared (``llmserve simulate
--fidelity``). The pure simulator (``llmserve.sim``) does not import this package."""
