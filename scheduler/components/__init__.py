"""The adapter's plain components: each does one job for the SGLang scheduler subclass and is
built and tested on its own, without an engine. They read SGLang's request and batch objects
only through the few attributes their docstrings name; none of them imports sglang."""
