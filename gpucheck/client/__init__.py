"""The client side: what runs in each CUDA client subprocess (`<program> --client <json spec>`). It reports JSON lines
on stdout ({"event": "ready"|"result"|"error"|...}) and waits for words on stdin ("go", "release")."""
