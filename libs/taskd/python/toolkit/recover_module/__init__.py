"""TaskD's recover module path: ``recover_manager`` and ``pb``, served by recoverd."""
