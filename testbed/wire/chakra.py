"""MLCommons Chakra execution traces on the wire: the schema (``et_def.proto``) declared
here as data, and the file format (a stream of length-delimited messages, gzipped or not).

The messages are declared field by field with the numbers and types of the published
schema (mlcommons/chakra ``schema/protobuf/et_def.proto``, package ``ChakraProtoMsg``,
MIT licence; Chakra 0.0.4, the schema ASTRA-sim 2.x reads): ``GlobalMetadata`` (version,
attributes), ``Node`` (id, name, type, ctrl_deps, data_deps, start_time_micros,
duration_micros, inputs, outputs, attr) and ``AttributeProto`` with every member of its
``value`` oneof. Fields this project does not read (``Node.storage``, added to the schema in
2026) are skipped by protobuf's parser like any unknown field, so newer traces still read.

A trace file (Chakra's ``protolib.encodeMessage`` / ``decodeMessage``): each message is
its byte length as a base-128 varint, then its bytes; the first message is the
``GlobalMetadata``, every later one a ``Node``. Chakra's converters may gzip the file; the
gzip magic number decides.

Only ``protobuf`` is imported here; the rest of the project sees plain Python values.
"""

from __future__ import annotations

import gzip
import io
import zlib

from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.message import DecodeError

from testbed.errors import ConfigError

PACKAGE = "ChakraProtoMsg"
MAX_MESSAGE_BYTES = 64 << 20  # one node; a real one is a few hundred bytes
MAX_FILE_BYTES = 1 << 30  # uncompressed

NODE_TYPES = ("INVALID_NODE", "METADATA_NODE", "MEM_LOAD_NODE", "MEM_STORE_NODE", "COMP_NODE", "COMM_SEND_NODE",
              "COMM_RECV_NODE", "COMM_COLL_NODE", "STORAGE_NODE", "BATCH_NODE", "CHECKPOINT_NODE")
COLLECTIVE_TYPES = ("ALL_REDUCE", "REDUCE", "ALL_GATHER", "GATHER", "SCATTER", "BROADCAST", "ALL_TO_ALL",
                    "REDUCE_SCATTER", "REDUCE_SCATTER_BLOCK", "BARRIER")

F = descriptor_pb2.FieldDescriptorProto
# AttributeProto's ``value`` oneof: (field name, number, scalar type); each scalar type
# also has a list member numbered one above it (``double_list`` = 4, ...)
ATTRIBUTE_VALUES = (("double", 3, F.TYPE_DOUBLE), ("float", 5, F.TYPE_FLOAT), ("int32", 7, F.TYPE_INT32),
                    ("int64", 9, F.TYPE_INT64), ("uint32", 11, F.TYPE_UINT32), ("uint64", 13, F.TYPE_UINT64),
                    ("sint32", 15, F.TYPE_SINT32), ("sint64", 17, F.TYPE_SINT64), ("fixed32", 19, F.TYPE_FIXED32),
                    ("fixed64", 21, F.TYPE_FIXED64), ("sfixed32", 23, F.TYPE_SFIXED32),
                    ("sfixed64", 25, F.TYPE_SFIXED64), ("bool", 27, F.TYPE_BOOL), ("string", 29, F.TYPE_STRING),
                    ("bytes", 31, F.TYPE_BYTES))


class TraceError(ConfigError):
    """A trace that cannot be replayed: one line naming the file and, where there is one,
    the node (exit status 2, like every input a user can fix)."""


def _list_type(scalar: str) -> str:
    return {"sint32": "Sint32", "sint64": "Sint64", "sfixed32": "Sfixed32", "sfixed64": "Sfixed64"}.get(
        scalar, scalar.capitalize()) + "List"


def _field(msg, name: str, number: int, ftype: int, label=F.LABEL_OPTIONAL, type_name: str = "", oneof=None):
    f = msg.field.add(name=name, number=number, type=ftype, label=label)
    if type_name:
        f.type_name = f".{PACKAGE}.{type_name}"
    if oneof is not None:
        f.oneof_index = oneof


def _schema() -> descriptor_pb2.FileDescriptorProto:
    """The part of et_def.proto this project reads, with the schema's own numbers."""
    fd = descriptor_pb2.FileDescriptorProto(name="testbed_et_def.proto", package=PACKAGE, syntax="proto3")
    attr = fd.message_type.add(name="AttributeProto")
    _field(attr, "name", 1, F.TYPE_STRING)
    _field(attr, "doc_string", 2, F.TYPE_STRING)
    attr.oneof_decl.add(name="value")
    for scalar, number, ftype in ATTRIBUTE_VALUES:
        _field(attr, f"{scalar}_val", number, ftype, oneof=0)
        _field(attr, f"{scalar}_list", number + 1, F.TYPE_MESSAGE, type_name=_list_type(scalar), oneof=0)
        lst = fd.message_type.add(name=_list_type(scalar))
        _field(lst, "values", 1, ftype, label=F.LABEL_REPEATED)
    meta = fd.message_type.add(name="GlobalMetadata")
    _field(meta, "version", 1, F.TYPE_STRING)
    _field(meta, "attr", 2, F.TYPE_MESSAGE, F.LABEL_REPEATED, "AttributeProto")
    for enum_name, values in (("NodeType", NODE_TYPES), ("CollectiveCommType", COLLECTIVE_TYPES)):
        enum = fd.enum_type.add(name=enum_name)
        for number, value in enumerate(values):
            enum.value.add(name=value, number=number)
    io = fd.message_type.add(name="IOInfo")
    for number, name in enumerate(("values", "shapes", "types"), 1):
        _field(io, name, number, F.TYPE_STRING)
    node = fd.message_type.add(name="Node")
    _field(node, "id", 1, F.TYPE_UINT64)
    _field(node, "name", 2, F.TYPE_STRING)
    node.field.add(name="type", number=3, type=F.TYPE_ENUM, label=F.LABEL_OPTIONAL, type_name=f".{PACKAGE}.NodeType")
    _field(node, "ctrl_deps", 4, F.TYPE_UINT64, F.LABEL_REPEATED)
    _field(node, "data_deps", 5, F.TYPE_UINT64, F.LABEL_REPEATED)
    _field(node, "start_time_micros", 6, F.TYPE_UINT64)
    _field(node, "duration_micros", 7, F.TYPE_UINT64)
    _field(node, "inputs", 8, F.TYPE_MESSAGE, type_name="IOInfo")
    _field(node, "outputs", 9, F.TYPE_MESSAGE, type_name="IOInfo")
    _field(node, "attr", 10, F.TYPE_MESSAGE, F.LABEL_REPEATED, "AttributeProto")
    return fd


def _classes() -> dict:
    pool = descriptor_pool.DescriptorPool()
    pool.Add(_schema())
    try:
        from google.protobuf.message_factory import GetMessageClass
    except ImportError:  # protobuf < 4.22
        from google.protobuf.message_factory import MessageFactory
        factory = MessageFactory(pool)
        return {n: factory.GetPrototype(pool.FindMessageTypeByName(f"{PACKAGE}.{n}"))
                for n in ("GlobalMetadata", "Node", "AttributeProto")}
    return {n: GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{n}"))
            for n in ("GlobalMetadata", "Node", "AttributeProto")}


_CLASSES = _classes()
GlobalMetadata = _CLASSES["GlobalMetadata"]
Node = _CLASSES["Node"]
AttributeProto = _CLASSES["AttributeProto"]


# -- the stream ---------------------------------------------------------------------------
def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def encode_stream(messages) -> bytes:
    """Chakra's ``encodeMessage`` for each message in turn."""
    out = bytearray()
    for m in messages:
        body = m.SerializeToString()
        out += varint(len(body)) + body
    return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple:
    """(value, next position), or (None, pos) when the data ends inside the varint."""
    value = shift = 0
    while pos < len(data):
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            return -1, pos
    return None, pos


def unpack(raw: bytes, label: str) -> bytes:
    """The stream's bytes: gunzipped when the file is gzip."""
    if raw[:2] != b"\x1f\x8b":
        return raw
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceError(f"{label}: a gzip file that does not unpack ({exc})") from None
    if len(data) > MAX_FILE_BYTES:
        raise TraceError(f"{label}: more than {MAX_FILE_BYTES} bytes unpacked: not a trace this tool replays")
    return data


def decode_stream(raw: bytes, label: str) -> tuple:
    """(GlobalMetadata, [Node, ...]) from a trace file's bytes. A stream that ends inside a
    message, a length beyond the file or a message that is not the schema's raises
    TraceError naming the file and the last node read."""
    data = unpack(raw, label)
    if not data:
        raise TraceError(f"{label}: empty (a trace starts with its GlobalMetadata)")
    pos, meta, nodes = 0, None, []
    while pos < len(data):
        where = "GlobalMetadata" if meta is None else (f"the node after node {nodes[-1].id}" if nodes
                                                        else "the first node")
        start = pos
        size, pos = _read_varint(data, pos)
        if size is None or size < 0 or size > MAX_MESSAGE_BYTES:
            problem = "ends inside its length" if size is None else "has a length that is not a message's"
            raise TraceError(f"{label}: {where} (byte {start}): {problem}: truncated or not a Chakra trace")
        if pos + size > len(data):
            raise TraceError(f"{label}: {where} (byte {start}): truncated: {size} bytes announced, "
                             f"{len(data) - pos} left")
        msg = GlobalMetadata() if meta is None else Node()
        try:
            msg.ParseFromString(data[pos:pos + size])
        except DecodeError as exc:
            raise TraceError(f"{label}: {where} (byte {start}): not a Chakra {type(msg).__name__} "
                             f"message ({exc})") from None
        pos += size
        if meta is None:
            meta = msg
        else:
            nodes.append(msg)
    return meta, nodes


# -- attributes ---------------------------------------------------------------------------
def attributes(msg) -> dict:
    """A node's (or the metadata's) attributes as {name: Python value}; list members as
    lists."""
    out = {}
    for a in msg.attr:
        which = a.WhichOneof("value")
        if which is None:
            out[a.name] = None
        elif which.endswith("_list"):
            out[a.name] = list(getattr(a, which).values)
        else:
            out[a.name] = getattr(a, which)
    return out


def attribute(name: str, value):
    """An AttributeProto the way Chakra's converters write it: bool -> bool_val, int ->
    int64_val, str -> string_val, list of bools -> bool_list, list of ints ->
    int64_list."""
    a = AttributeProto(name=name)
    if isinstance(value, bool):
        a.bool_val = value
    elif isinstance(value, int):
        a.int64_val = value
    elif isinstance(value, float):
        a.double_val = value
    elif isinstance(value, str):
        a.string_val = value
    elif isinstance(value, (list, tuple)) and all(isinstance(v, bool) for v in value):
        a.bool_list.values.extend(value)
    elif isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
        a.int64_list.values.extend(value)
    else:
        raise TypeError(f"attribute {name}: no Chakra value type for {value!r}")
    return a


def node_type_name(number: int) -> str:
    return NODE_TYPES[number] if 0 <= number < len(NODE_TYPES) else f"node type {number}"


def collective_name(number) -> str:
    return COLLECTIVE_TYPES[number] if isinstance(number, int) and 0 <= number < len(COLLECTIVE_TYPES) \
        else f"collective type {number!r}"
