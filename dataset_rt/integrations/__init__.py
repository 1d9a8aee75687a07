"""Optional integrations (PyTorch, Ray). Each submodule imports its framework on import;
``import dataset_rt`` never imports them."""
