"""Argument type errors that name the argument.

When a call to the extension matches none of its signatures, pybind11 raises a TypeError that
lists the signatures and the call but not which argument is wrong. `name_arguments` wraps the
extension's functions and methods so that such a call raises meshtensor.ArgumentTypeError (an
InvalidArgument and a TypeError) naming the first argument that does not fit, what it must be and
what it was.
"""

import functools
import numbers
import re

_SIGNATURE = re.compile(r"^\s*\d+\.\s*[\w.]*\((.*)\)(?:\s*->.*)?$", re.MULTILINE)
_MAX_REPR = 80


def _split_top_level(text, separator=","):
    """Splits at separators outside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char in "[(":
            depth += 1
        elif char in "])":
            depth -= 1
        elif char == separator and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    tail = text[start:].strip()
    if tail:
        parts.append(tail)
    return parts


def _parameters(signature):
    """[(name, annotation, has_default, keyword_only)] of one pybind11 signature."""
    parameters, keyword_only = [], False
    for part in _split_top_level(signature):
        if part == "*":
            keyword_only = True
            continue
        if part.startswith("*"):  # *args, **kwargs: anything goes
            return parameters, True
        name, _, rest = part.partition(":")
        annotation, _, default = rest.partition("=")
        parameters.append((name.strip(), annotation.strip(), bool(default), keyword_only))
    return parameters, False


def _fits(value, annotation, classes):
    """Whether `value` can be what pybind11 converts to `annotation` (True when unsure)."""
    if annotation in ("", "object", "Any", "handle", "args", "kwargs"):
        return True
    optional = re.fullmatch(r"Optional\[(.*)\]", annotation)
    if optional:
        return value is None or _fits(value, optional.group(1), classes)
    sequence = re.fullmatch(r"(?:List|list|Sequence)\[(.*)\]", annotation)
    if sequence:
        if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
            return False
        try:
            return all(_fits(item, sequence.group(1), classes) for item in value)
        except TypeError:
            return False
    mapping = re.fullmatch(r"(?:Dict|dict)\[(.*)\]", annotation)
    if mapping or annotation == "dict":
        return isinstance(value, dict)
    simple = {
        "int": lambda v: isinstance(v, numbers.Integral) or hasattr(v, "__index__"),
        "float": lambda v: isinstance(v, numbers.Real) or hasattr(v, "__float__"),
        "bool": lambda v: isinstance(v, bool) or type(v).__name__ == "bool_",
        "str": lambda v: isinstance(v, str),
        "list": lambda v: isinstance(v, list),
        "tuple": lambda v: isinstance(v, tuple),
        "Callable": callable,
    }
    if annotation in simple:
        return simple[annotation](value)
    cls = classes.get(annotation.rsplit(".", 1)[-1])
    return True if cls is None else isinstance(value, cls)


def _describe(value):
    text = repr(value)
    if len(text) > _MAX_REPR:
        text = text[:_MAX_REPR] + "..."
    return f"{type(value).__name__} {text}"


def _mismatch(name, signature, args, kwargs, classes):
    """The problem of the call against one signature, or None when it fits."""
    parameters, open_ended = _parameters(signature)
    positional = [p for p in parameters if not p[3]]
    if len(args) > len(positional) and not open_ended:
        count = sum(1 for p in positional if p[0] != "self")
        return f"{name}() takes {count} positional arguments, but more were given"
    given = {}
    for parameter, value in zip(positional, args):
        given[parameter[0]] = value
    known = {p[0] for p in parameters}
    for key, value in kwargs.items():
        if key not in known and not open_ended:
            return f"{name}() got an unexpected keyword argument '{key}'"
        given[key] = value
    for parameter_name, annotation, has_default, _ in parameters:
        if parameter_name == "self":
            continue
        if parameter_name not in given:
            if not has_default:
                return f"{name}() is missing the argument '{parameter_name}'"
            continue
        value = given[parameter_name]
        if annotation == "int" and isinstance(value, numbers.Integral) and \
                not -2**63 <= value < 2**64:
            return f"{name}(): argument '{parameter_name}' is {value}, outside the 64-bit integers"
        if not _fits(value, annotation, classes):
            expected = annotation.replace("meshtensor._meshtensor.", "")
            return f"{name}(): argument '{parameter_name}' must be {expected}, got {_describe(value)}"
    return None


def _explain(name, message, args, kwargs, classes):
    signatures = _SIGNATURE.findall(message)
    problems = [_mismatch(name, s, args, kwargs, classes) for s in signatures]
    problems = [p for p in problems if p]
    if problems:
        return problems[0]
    first_line = message.splitlines()[0] if message else "incompatible arguments"
    own = f"{name.rsplit('.', 1)[-1]}(): "
    if first_line.startswith(own):  # pybind11 names the function already
        first_line = first_line[len(own):]
    return f"{name}(): {first_line}"


def _wrap(function, name, classes, error_class, constructor=False):
    @functools.wraps(function)
    def call(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except TypeError as error:
            message = str(error)
            if "incompatible function arguments" not in message and \
                    "incompatible constructor arguments" not in message:
                raise
            if error.__traceback__ is not None and error.__traceback__.tb_next is not None:
                raise  # raised deeper (in a function this one called back): not our arguments
            shown = args[1:] if constructor else args  # constructor signatures omit self
            raise error_class(_explain(name, message, shown, kwargs, classes)) from None
    return call


def name_arguments(namespace, extension, error_class, prefix=""):
    """Wraps the extension's functions in `namespace` (named `prefix` + name in messages) and the
    methods of its classes."""
    classes = {k: v for k, v in vars(extension).items() if isinstance(v, type)}
    for key, value in list(namespace.items()):
        if key.startswith("__"):
            continue
        if callable(value) and type(value).__name__ == "builtin_function_or_method":
            namespace[key] = _wrap(value, prefix + key, classes, error_class)
    if prefix:
        return
    for class_name, cls in classes.items():
        if issubclass(cls, BaseException):
            continue
        for attribute, member in list(vars(cls).items()):
            if attribute.startswith("__") and attribute not in ("__init__", "__call__"):
                continue
            kind = type(member).__name__
            label = f"{class_name}.{attribute}" if attribute != "__init__" else class_name
            if kind == "instancemethod":
                setattr(cls, attribute, _wrap(member, label, classes, error_class,
                                              constructor=attribute == "__init__"))
            elif kind == "staticmethod":
                setattr(cls, attribute, staticmethod(
                    _wrap(member.__func__, label, classes, error_class)))
