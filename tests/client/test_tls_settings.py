"""TLS in the connection settings: the scheme of a connection string, the Spark options, and
settings that still pickle (Spark ships them to executors)."""

from __future__ import annotations

import pickle

import pytest

from dcpkv.client.settings import ConnectionSettings, NodeAddressError, scheme_tls
from dcpkv.core.tls import TlsSettings
from dcpkv.spark.options import OptionError, parse_options


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("couchbases://h1,h2:11207", (True, "h1,h2:11207")),
        ("couchbase://h1", (False, "h1")),
        ("h1:11210", (False, "h1:11210")),
        ("", (False, "")),
    ],
)
def test_scheme_tls(url: str, expected: tuple[bool, str]) -> None:
    assert scheme_tls(url) == expected


def test_an_unknown_scheme_is_refused() -> None:
    with pytest.raises(NodeAddressError, match="unknown scheme 'http'"):
        scheme_tls("http://h1")


@pytest.mark.parametrize(
    ("options", "tls"),
    [
        ({"port": "11210"}, None),
        ({"tls": "true", "tlsCa": "/ca.pem"}, TlsSettings(ca="/ca.pem")),
        ({"nodes": "couchbases://h:11207", "tlsCa": "/ca.pem"}, TlsSettings(ca="/ca.pem")),
        ({"TLS": "true", "tlsVerify": "false"}, TlsSettings(verify=False)),
        ({"tls": "true", "tlsCert": "/c.pem", "tlsKey": "/k.pem"},
         TlsSettings(cert="/c.pem", key="/k.pem")),
    ],
)  # fmt: skip
def test_spark_tls_options(options: dict[str, str], tls: TlsSettings | None) -> None:
    parsed = parse_options(options).connection
    assert parsed.tls == tls
    # what the pipelines hand Spark parses back to the same settings
    assert parse_options(parsed.spark_options()).connection == parsed


def test_bad_spark_tls_options_say_which() -> None:
    with pytest.raises(OptionError, match="tlsVerify"):
        parse_options({"tls": "true", "tlsVerify": "maybe"})
    with pytest.raises(OptionError, match="unknown scheme"):
        parse_options({"nodes": "https://h:1"})


def test_settings_with_tls_pickle() -> None:
    settings = ConnectionSettings.at("h", 11207, tls=TlsSettings(ca="/ca.pem"))
    assert pickle.loads(pickle.dumps(settings)) == settings
