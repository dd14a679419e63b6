"""How :class:`~dask_otel_spans.scheduler.plugin.OTelSpansPlugin` travels to its
scheduler (``client.register_plugin`` pickles it): a scheduler in the process that
made it gets the very same object, with the providers it was given; any other, a new
plugin of the same settings, configured from that scheduler's environment."""
from __future__ import annotations

import logging
import uuid
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dask_otel_spans.scheduler.plugin import OTelSpansPlugin

logger = logging.getLogger(__name__)

#: Plugins created in this process, so that one registered through
#: ``client.register_plugin`` on an in-process scheduler keeps its providers
_LOCAL_PLUGINS: weakref.WeakValueDictionary[str, OTelSpansPlugin] = (
    weakref.WeakValueDictionary()
)

#: What :func:`reduce_plugin` gives pickle: :func:`restore_plugin` and its arguments
Reduced = tuple[Callable[..., "OTelSpansPlugin"], tuple[str, dict[str, object], bool, bool]]


def remember(plugin: OTelSpansPlugin) -> str:
    """Note ``plugin`` as made in this process (held weakly); its token."""
    token = uuid.uuid4().hex
    _LOCAL_PLUGINS[token] = plugin
    return token


def forget(token: str) -> None:
    """The plugin of ``token`` is closed: a copy unpickled later is a new one."""
    _LOCAL_PLUGINS.pop(token, None)


def reduce_plugin(token: str, settings: dict[str, object], had_providers: bool,
                  use_global: bool) -> Reduced:
    """A plugin's ``__reduce__``: its token (:func:`remember`), its settings (keyword
    arguments), whether it was given providers, and whether it may use the process's
    global ones."""
    return restore_plugin, (token, dict(settings), had_providers, use_global)


def restore_plugin(
    token: str, settings: dict[str, Any], had_providers: bool, use_global: bool
) -> OTelSpansPlugin:
    """Unpickle a plugin: the very same object when the scheduler is in the process
    that created it, else a new one configured from this process's environment."""
    plugin = _LOCAL_PLUGINS.get(token)
    if plugin is not None:
        return plugin
    if had_providers:
        logger.warning(
            "dask_otel_spans: providers passed to OTelSpansPlugin cannot travel to a "
            "scheduler in another process; using this scheduler's OTEL_* configuration"
        )
    from dask_otel_spans.scheduler.plugin import OTelSpansPlugin

    return OTelSpansPlugin(use_global_providers=use_global, **settings)
