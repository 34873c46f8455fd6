"""HeadSources: a source path's link to the head entry that serves it."""
import os

from helpers import age_head_link as age

from mmdata_plugin.cache.head_sources import HeadSources


def _entry(tmp_path, name):
    path = tmp_path / 'store' / 'head' / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b'entry')
    return str(path)


def test_a_source_is_served_while_its_linked_entry_is_on_disk(tmp_path):
    sources = HeadSources(str(tmp_path / 'store'), 'f' * 40)
    url = 's3://bucket/a.jpg'
    assert not sources.serves(url)
    first = _entry(tmp_path, 'first')
    sources.record(url, first)
    assert sources.serves(url) and not sources.serves('s3://bucket/b.jpg')
    age(sources, url)
    assert sources.serves(url)
    os.unlink(first)  # evicted
    assert not sources.serves(url)
    # A newer entry (the object changed, the sample was stored again)
    # takes the link over.
    second = _entry(tmp_path, 'second')
    sources.record(url, second)
    assert sources.serves(url)
    link = sources.link_path(url)
    assert os.path.realpath(link) == os.path.realpath(second)
    # Recording the same entry again leaves the link as it is, and no
    # temporary link behind.
    before = os.lstat(link).st_ino
    sources.record(url, second)
    assert os.lstat(link).st_ino == before
    assert os.listdir(os.path.dirname(link)) == [os.path.basename(link)]


def test_a_link_to_an_entry_being_produced_counts_for_a_while(tmp_path):
    sources = HeadSources(str(tmp_path / 'store'), 'f' * 40)
    url = 's3://bucket/a.jpg'
    coming = str(tmp_path / 'store' / 'head' / 'coming')
    sources.record(url, coming, producing=True)
    # The file's read is reported before its entry is stored: meanwhile
    # the link alone says the head serves it.
    assert sources.serves(url)
    age(sources, url)
    assert not sources.serves(url)  # never stored (no room), or evicted
    # Producing it again counts afresh.
    sources.record(url, coming, producing=True)
    assert sources.serves(url)


def test_links_are_per_head_fingerprint_and_survive_a_moved_store(tmp_path):
    url = 'http://host/a.jpg'
    entry = _entry(tmp_path, 'e')
    HeadSources(str(tmp_path / 'store'), 'a' * 40).record(url, entry)
    assert not HeadSources(str(tmp_path / 'store'), 'b' * 40).serves(url)
    os.rename(tmp_path / 'store', tmp_path / 'moved')
    assert HeadSources(str(tmp_path / 'moved'), 'a' * 40).serves(url)
