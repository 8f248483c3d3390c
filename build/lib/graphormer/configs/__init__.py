"""The packaged Hydra configs (a package, so that Hydra finds them from an installed graphormer)."""
