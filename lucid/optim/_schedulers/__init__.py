"""The lr_scheduler classes, by family; ``lucid.optim.lr_scheduler`` is the public module."""
