"""Serving a trained model over HTTP: ``graphormer-serve`` (:mod:`graphormer.serving.app`), its
JSON API and its web page (``static/``)."""
