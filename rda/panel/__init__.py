"""rda panel: a live web panel for operators (``rda panel``, extra ``[panel]``).

One rda client (a ``ClientService``) underneath, whatever the number of browser tabs; a
Starlette application served by uvicorn on top, pushing live values over one WebSocket per
tab. Nothing is configured: servers come from the directory, devices and properties from the
admin ``devices`` command, value shapes from the values themselves (docs/panel.md).

Modules, one job each:

- ``render``: ``Data`` and ``DataContext`` -> JSON for the browser (arrays decimated to min/max
  per pixel column, 2-D arrays to a small grey image, nested values as trees);
- ``views``: the coalescing between rda listener threads and a tab (at most 30 frames per
  second per view, counting what each frame folds);
- ``source``: the rda side: learns servers, devices and properties, shares one subscription
  per (device, property, selector) among the views, runs sets;
- ``session``: one WebSocket tab: its views, its sender loop, its requests;
- ``history``: the recorded past for the strip chart (a store read with pyarrow, or a
  recorder serving history over rda);
- ``hosts``: the ``Host`` names the panel answers to (its defence against DNS rebinding);
- ``app``: the Starlette routes and the uvicorn runner; ``cli``: the ``rda panel`` command.

A facade package: it may import every layer; nothing below imports it (``rda._cli`` adds
the command only when starlette and uvicorn import).
"""
