"""The application on top of the library: task modules, data modules, model sources and the ``lightning-zero``
commands (``fit``, ``plan``, ``consolidate``, ``chat``...). It needs the ``app`` extra
(``pip install 'lightning-zero[app]'``); the strategies, checkpoints and ``zero_auto`` below it never import it."""
