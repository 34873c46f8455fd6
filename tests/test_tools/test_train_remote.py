"""tools/train.py on the demo config reading its data over HTTP."""

from helpers import REPO_ROOT, TRAIN_SCRIPT, quick_cfg_options

from mmdata_plugin.testing import LoopbackHTTPServer, run_script

HTTP_CONFIG = f'{REPO_ROOT}/configs/demo/tinycnn_demo-jpeg-http.py'


def test_demo_trains_from_the_loopback_http_remote(demo_root, train_env,
                                                   tmp_path):
    with LoopbackHTTPServer(demo_root, latency=0.01, fault_rate=0.01,
                            seed=1, stall=2.0) as srv:
        env = dict(
            train_env,
            MMDATA_REMOTE_ROOT=srv.base_url,
            MMDATA_REMOTE_FILES_DIR=str(tmp_path / 'remote_files'),
            MMDATA_INDEX_DIR=str(tmp_path / 'index'))
        out = run_script(TRAIN_SCRIPT, [
            HTTP_CONFIG, '--work-dir',
            str(tmp_path / 'work')
        ] + quick_cfg_options(max_iters=4, interval=4),
                          env=env).stdout
        stats, base_url = srv.stats(), srv.base_url
    assert 'Saving checkpoint at 4 iterations' in out
    assert f'{base_url}train.txt: fetched to' in out
    # One fetch per list; the images came over HTTP, none from disk.
    assert stats.downloads['train.txt'] == 1
    assert stats.downloads['val.txt'] == 1
    assert sum(n for path, n in stats.downloads.items()
               if path.endswith('.jpg')) >= 4 * 4
