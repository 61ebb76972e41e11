"""What a test changes in a model's processor, without patching transformers: a new processor
built from the shared one's parts with some replaced, and a subclass of a part's own class that
records each call (loaded from the model's files, so it tokenizes or resizes exactly as the part
it stands for). The shared processor and the library's classes stay as they are."""

from __future__ import annotations

from typing import Callable


def processor_with(processor, **parts):
    """A processor of `processor`'s class over its tokenizer, image and video processors and chat
    template, with the parts named in `parts` (tokenizer=, image_processor=, ...) replaced."""
    kept = {"tokenizer": processor.tokenizer, "image_processor": processor.image_processor,
            "video_processor": processor.video_processor, "chat_template": processor.chat_template}
    return type(processor)(**{**kept, **parts})


def recording_class(base: type, record: Callable[..., None]) -> type:
    """A subclass of `base` (a tokenizer or image processor class) whose calls first hand their
    arguments to `record`, then run `base`'s own `__call__`. Load it with `.from_pretrained(dir)`."""

    class Recording(base):
        def __call__(self, *args, **kwargs):
            record(*args, **kwargs)
            return super().__call__(*args, **kwargs)

    Recording.__name__ = Recording.__qualname__ = f"Recording{base.__name__}"
    return Recording
