"""peer_prefix: the networks per-prefix caps count in."""

from meshnet.peers import peer_prefix


def test_peer_prefixes():
    assert peer_prefix("10.1.2.3") == "10.1.2.0/24"
    assert peer_prefix("2001:db8:1:2:aaaa::1") == "2001:db8:1:2::/64"
    assert peer_prefix("::ffff:10.1.2.3") == "10.1.2.0/24"
    assert peer_prefix("unix:/tmp/sock") == "unix:/tmp/sock"
    assert peer_prefix("") == ""
