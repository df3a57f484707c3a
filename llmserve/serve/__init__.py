"""``llmserve serve``: the composition root. One file (``serve_config.py``) becomes a
gateway, its pools and their elastic controllers with their providers
(``serve.py``, ``deployment.py``) with the controllers' admin API on the gateway
(``admin.py``); ``serve_process.py`` runs it as a child process."""
