"""Request bodies of the HTTP API and their translation into `Item`s: OpenAI's /v1/embeddings
(`input` as a string or list of strings), vLLM's chat-embedding extension (`messages` with a
system turn as the instruction and a user turn of `text` and `image_url` parts), data: URLs and
uploaded image bytes; and the response encodings (float lists or base64 little-endian float32).

Receives parsed JSON; hands `Item`s to the engine and encoded vectors back to the client.
Every error is an `InputError` naming the field that was wrong (HTTP 400).
"""

from __future__ import annotations

import base64
import binascii
import io
import ipaddress
import socket
import urllib.parse
import urllib.request
from typing import Annotated, Any, Literal, Mapping, Optional, Union

import numpy as np
from PIL import Image
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, create_model
from pydantic_core import PydanticCustomError

from faste_mm import Item
from faste_mm.errors import ConfigError, InputError
from faste_mm.indexers.filters import INT64_MAX
from faste_mm.retrieval.search_request import (DEFAULTS, OPTIONS, WHERE_VALUES, SearchRequest,
                                               check_option, options_for)

InputType = Literal["query", "document"]
MAX_IMAGE_PIXELS = 64_000_000  # decompression-bomb guard for images sent over HTTP


# ---- request bodies ------------------------------------------------------------------------
class ImageURL(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str
    detail: str | None = None  # accepted for OpenAI compatibility; the resize is the model's


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "image_url"]
    text: str | None = None
    image_url: Union[ImageURL, str, None] = None


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user"]
    content: Union[str, list[ContentPart]]


class EmbeddingRequest(BaseModel):
    """POST /v1/embeddings: OpenAI's fields plus vLLM's `messages` and an `input_type`."""

    model_config = ConfigDict(extra="forbid")
    input: Union[str, list[str], None] = None
    messages: list[Message] | None = None
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    input_type: InputType | None = None
    user: str | None = None  # OpenAI's end-user tag; accepted and ignored
    # TEI's `truncate`: true (the default here, as the official Qwen3-VL-Embedding code cuts at
    # max_length) embeds an over-long input's first max_length tokens and marks it `truncated`
    # in the answer; false refuses it with 413.
    truncate: bool = True


def _declared_where(value: Any) -> Any:
    """A `where` of a shape the request takes, else the request's own message naming `where` and
    the shapes it takes (not pydantic's complaint per member of the union)."""
    try:
        check_option("where", value)
    except ConfigError as error:
        raise PydanticCustomError("where", str(error)) from None  # no context: the braces stay as written
    return value


# POST /search's JSON body and the MCP search tool's arguments are made from the declarations of
# `faste_mm.retrieval.search_request` (one per option): `request_model`, `to_request`, `form_request`.
_JSON_TYPES: dict[str, Any] = {"text": str, "int": int, "float": float, "bool": bool, "image": str,
                               "like": Union[Annotated[int, Field(ge=0, le=INT64_MAX)], str],
                               "where": Annotated[Union[str, list[str], dict[str, Union[WHERE_VALUES]]],
                                                  BeforeValidator(_declared_where)],
                               "texts": Union[str, list[str]], "box": Union[list[int], str]}


def request_model(front: str, name: str, *, leave_out: tuple[str, ...] = (), limits: Mapping[str, dict] | None = None,
                  extra: Mapping[str, tuple] | None = None) -> type[BaseModel]:
    """A pydantic model of the options `front` shows ("http", "mcp"): each option's JSON type,
    default, bounds (the front end's own maximum) and help as its description; `limits` adds
    constraints by option (MCP's max_length), `extra` adds the front end's own fields; an
    option's aliases (`id` for `like`) are fields too. Unknown fields are refused by name."""
    fields: dict[str, Any] = {}
    for option_name, declared in options_for(front).items():
        if option_name in leave_out:
            continue
        kind = declared.kind
        annotation = Literal[declared.choices] if kind == "choice" else _JSON_TYPES[kind]
        if kind == "texts" and front == "mcp":  # an assistant reads the choices off the schema
            annotation = Union[Literal[declared.choices], list[Literal[declared.choices]]]
        bounds = {"ge": declared.bounds.get("min"), "le": declared.maximum(front) if declared.bounds else None} \
            if kind in ("int", "float") else {}
        default = DEFAULTS[option_name]
        field_type = Optional[annotation] if default is None else annotation
        spec = {k: v for k, v in bounds.items() if v is not None} | dict((limits or {}).get(option_name, {}))
        for key in (option_name, *declared.aliases):
            fields[key] = (field_type, Field(default, **({"description": declared.help} | spec)))
    return create_model(name, __config__=ConfigDict(extra="forbid"), **fields, **dict(extra or {}))


def to_request(values: Mapping[str, Any], where: str, **inputs: Any) -> SearchRequest:
    """A `SearchRequest` of a parsed body's values (its aliases read as their option: `id` is
    `like`) and the front end's decoded `inputs` (an image); InputError (HTTP 400 / a tool
    error) naming the bad option."""
    given = {}
    for name, declared in OPTIONS.items():
        for key in (name, *declared.aliases):
            if values.get(key) is not None:
                given[name] = values[key]
    given.update({name: value for name, value in inputs.items()})
    if isinstance(given.get("query"), str):
        given["query"] = given["query"].strip() or None
    try:
        return SearchRequest.of(where, **given)
    except ConfigError as error:
        raise InputError(str(error)) from None


def form_values(form, front: str = "form") -> dict[str, Any]:
    """A multipart or urlencoded search form's fields as option values (`q` the query text, `id`
    the item of more-like-this; numbers, true/false and repeatable fields parsed by each option's
    declaration); the uploaded `image` is the caller's. InputError naming an unknown or bad field."""
    by_field = {}
    for name, declared in options_for(front).items():
        for key in (declared.form or name, *declared.aliases):
            by_field[key] = (name, declared)
    unknown = set(form.keys()) - set(by_field) - {"image"}
    if unknown:
        raise InputError(f"unknown form fields {sorted(unknown)}; the search form takes {', '.join(sorted(by_field))} "
                         f"and image")
    values: dict[str, Any] = {}
    for key, (name, declared) in by_field.items():
        if key == "image":
            continue
        raw = [str(v).strip() for v in form.getlist(key) if isinstance(v, str) and str(v).strip()]
        if not raw:
            continue
        if declared.kind in ("texts", "where"):
            values[name] = raw
        else:
            values[name] = _form_value(raw[-1], key, name, declared, front)
    return values


def _form_value(text: str, key: str, name: str, declared, front: str) -> Any:
    kind = declared.kind
    if kind == "bool":
        lowered = text.lower()
        if lowered not in ("1", "true", "on", "yes", "0", "false", "off", "no"):
            raise InputError(f"form field {key!r} must be true or false, got {text[:40]!r}")
        return lowered in ("1", "true", "on", "yes")
    if kind in ("int", "like") and (kind == "int" or text.isdigit()):
        if not (text.isascii() and text.lstrip("-").isdigit() and len(text) <= 20 and abs(int(text)) <= INT64_MAX):
            raise InputError(f"form field {key!r} must be an integer, got {text[:40]!r}")
        value = int(text)
    elif kind == "float":
        try:
            value = float(text)
        except ValueError:
            raise InputError(f"form field {key!r} must be a number, got {text[:40]!r}") from None
    else:
        return text
    if kind != "like":
        try:
            check_option(name, value, front)
        except ConfigError as error:
            raise InputError(f"form field {key!r}: {error}") from None
    return value


# ---- translation into items ------------------------------------------------------------------
def embedding_items(request: EmbeddingRequest, allow_remote_images: bool) -> tuple[list[Item], str | None]:
    """The items of an embeddings request and the instruction its system turn gives (or None).

    `input`: one text item per string. `messages`: ONE item (one conversation, one vector, as
    vLLM does): the user turn's image and text; the system turn's text is the instruction.
    """
    if (request.input is None) == (request.messages is None):
        raise InputError("give exactly one of `input` (a string or a list of strings) or `messages` "
                         "(a chat with a user turn of text and image_url parts)")
    if request.input is not None:
        texts = [request.input] if isinstance(request.input, str) else list(request.input)
        if not texts:
            raise InputError("`input` is an empty list; give at least one string")
        return [Item(text=text) for text in texts], None
    return [_conversation_item(request.messages, allow_remote_images)], _system_text(request.messages)


def _system_text(messages: list[Message]) -> str | None:
    systems = [m for m in messages if m.role == "system"]
    if len(systems) > 1:
        raise InputError(f"`messages` has {len(systems)} system turns; give at most one (the instruction)")
    if not systems:
        return None
    return _text_of(systems[0].content, "messages[system].content", allow_images=False)


def _conversation_item(messages: list[Message], allow_remote_images: bool) -> Item:
    users = [(i, m) for i, m in enumerate(messages) if m.role == "user"]
    if len(users) != 1:
        raise InputError(f"`messages` has {len(users)} user turns; give exactly one (the content to embed)")
    position, user = users[0]
    if isinstance(user.content, str):
        return Item(text=user.content)
    return parts_item(user.content, f"messages[{position}].content", allow_remote_images)


def parts_item(parts: list[ContentPart], where: str, allow_remote_images: bool) -> Item:
    """Content parts (text, image_url) as one `Item`: the texts joined by newlines, at most one
    image; InputError naming the part (`where[index]`)."""
    texts: list[str] = []
    images: list[Image.Image] = []
    for index, part in enumerate(parts):
        if part.type == "text":
            if part.text is None:
                raise InputError(f"{where}[{index}]: a text part needs `text`")
            texts.append(part.text)
        else:
            if part.image_url is None:
                raise InputError(f"{where}[{index}]: an image_url part needs `image_url` with a `url`")
            url = part.image_url if isinstance(part.image_url, str) else part.image_url.url
            images.append(decode_image_url(url, f"{where}[{index}].image_url", allow_remote_images))
    if len(images) > 1:
        raise InputError(f"{where} has {len(images)} images; an item holds at most one (send one request per image)")
    return Item(text="\n".join(texts) if texts else None, image=images[0] if images else None)


def _text_of(content, where: str, allow_images: bool) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for index, part in enumerate(content):
        if part.type != "text" and not allow_images:
            raise InputError(f"{where}[{index}]: only text parts are allowed here, got {part.type}")
        texts.append(part.text or "")
    return "\n".join(texts)


# ---- images ---------------------------------------------------------------------------------
def decode_image_url(url: str, where: str, allow_remote: bool, max_bytes: int = 32 << 20) -> Image.Image:
    """A data: URL decoded in memory; an http(s) URL fetched only when `allow_remote` (fetching
    arbitrary URLs would let clients probe the server's network, SSRF); nothing else (never a
    server path: file:// is refused)."""
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":
        header, _, data = url.partition(",")
        if ";base64" not in header.lower():
            raise InputError(f"{where}: only base64 data: URLs are supported (data:image/png;base64,...)")
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise InputError(f"{where}: the data: URL is not valid base64") from None
        return decode_image_bytes(raw, where)
    if scheme in ("http", "https"):
        if not allow_remote:
            raise InputError(f"{where}: remote image URLs are not fetched by this server; send the image "
                             f"as a data: URL (or start the server with --allow-remote-images)")
        return decode_image_bytes(_fetch(url, where, max_bytes), where)
    raise InputError(f"{where}: unsupported image URL scheme {scheme or url[:20]!r}; send a data: URL")


def decode_image_bytes(raw: bytes, where: str) -> Image.Image:
    """Decode image bytes fully (so a truncated file fails here, with its field named)."""
    if not raw:
        raise InputError(f"{where}: the image is empty (0 bytes)")
    try:
        with Image.open(io.BytesIO(raw)) as opened:
            if opened.width * opened.height > MAX_IMAGE_PIXELS:
                raise InputError(f"{where}: image of {opened.width}x{opened.height} pixels is too large "
                                 f"(limit {MAX_IMAGE_PIXELS}); downscale it first")
            opened.load()
            return opened.copy() if opened.mode != "P" else opened.convert("RGBA")
    except InputError:
        raise
    except (OSError, ValueError, Image.DecompressionBombError) as error:
        raise InputError(f"{where}: not a readable image ({type(error).__name__}: {error})") from None


def _fetch(url: str, where: str, max_bytes: int) -> bytes:
    host = urllib.parse.urlsplit(url).hostname or ""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError as error:
        raise InputError(f"{where}: cannot resolve {host!r} ({error})") from None
    if any(not ipaddress.ip_address(address.split("%")[0]).is_global for address in addresses):
        raise InputError(f"{where}: {host} resolves to a private or loopback address; refused")
    try:
        with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 (scheme checked above)
            raw = response.read(max_bytes + 1)
    except OSError as error:
        raise InputError(f"{where}: cannot fetch {url} ({error})") from None
    if len(raw) > max_bytes:
        raise InputError(f"{where}: {url} is larger than {max_bytes} bytes")
    return raw


# ---- responses ------------------------------------------------------------------------------
def truncate_dimensions(vectors: np.ndarray, dimensions: int | None) -> np.ndarray:
    """Matryoshka: the first `dimensions` dims, re-normalised (docs/design.md); None keeps all."""
    if dimensions is None or dimensions == vectors.shape[1]:
        return vectors
    if dimensions > vectors.shape[1]:
        raise InputError(f"`dimensions` is {dimensions}, but this model's vectors have {vectors.shape[1]}; "
                         f"give at most {vectors.shape[1]}")
    kept = vectors[:, :dimensions]
    norms = np.linalg.norm(kept, axis=1, keepdims=True)
    return (kept / np.maximum(norms, 1e-12)).astype(np.float32)


def encode_vector(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    """"float": a JSON list; "base64": base64 of the little-endian float32 bytes (OpenAI's)."""
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return [float(x) for x in vector]
