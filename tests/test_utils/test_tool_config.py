"""The config loading shared by benchmark_dataloader and compare_decoders."""
import argparse

import pytest

from mmdata_plugin.utils.tool_config import (add_dataloader_arguments,
                                             load_dataloader_config)


def test_split_overrides_and_missing_dataloader(tmp_path):
    config = tmp_path / 'cfg.py'
    config.write_text("train_dataloader = dict(batch_size=2, num_workers=1)\n"
                      "val_dataloader = dict(batch_size=4)\n")
    parser = argparse.ArgumentParser()
    add_dataloader_arguments(parser)
    args = parser.parse_args(
        ['--split', 'val', '--cfg-options', 'val_dataloader.batch_size=8'])

    cfg, loader_cfg = load_dataloader_config(
        str(config), args.split, args.cfg_options)
    assert loader_cfg.batch_size == 8
    assert cfg.train_dataloader.num_workers == 1
    assert parser.parse_args([]).split == 'train'

    with pytest.raises(SystemExit, match=r'cfg\.py has no test_dataloader'):
        load_dataloader_config(str(config), 'test')
