"""What a COCO-format annotation file does that a COCO dataset does not say.

pycocotools indexes the file with ``ann['image_id']``: an annotation without
that key ends the build with a bare ``KeyError: 'image_id'`` naming neither
the file nor the annotation. And an annotation whose ``image_id`` names no
image is dropped without a word (mmdet's ``CocoDataset`` reads annotations
per image). ``tools/dump_data_list.py`` names both, reading the file again
only when it has to: after such a ``KeyError``, or for ``--check``.
"""
import json
import os.path as osp
from typing import Iterator, List, NamedTuple, Optional

#: Keys read with ``[]`` (pycocotools' index, mmdet's ``parse_data_info``).
REQUIRED_KEYS = dict(
    images=('id', 'file_name', 'width', 'height'),
    annotations=('id', 'image_id', 'category_id', 'bbox'))
#: Ids of dropped annotations named in the report.
_SHOWN_IDS = 10


class DroppedAnnotations(NamedTuple):
    """Annotations of ``path`` whose ``image_id`` names no image."""
    path: str
    total: int
    ids: List


def coco_files(dataset_cfg) -> List[str]:
    """The local ``.json`` annotation files a dataset config names, those of
    wrapped datasets included, joined to their ``data_root`` as
    mmengine's ``BaseDataset`` does."""
    found = []
    for cfg in _dicts(dataset_cfg):
        ann_file = cfg.get('ann_file')
        if not isinstance(ann_file, str) or not ann_file.endswith('.json'):
            continue
        if not osp.isabs(ann_file) and cfg.get('data_root'):
            ann_file = osp.join(cfg['data_root'], ann_file)
        if osp.isfile(ann_file):
            found.append(ann_file)
    return found


def _dicts(value) -> Iterator[dict]:
    if isinstance(value, dict):
        yield value
        for item in value.values():
            yield from _dicts(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _dicts(item)


def _load(path: str) -> Optional[dict]:
    """The file's content if it is COCO-shaped, else None."""
    with open(path, encoding='utf-8') as file:
        content = json.load(file)
    if isinstance(content, dict) and all(
            isinstance(content.get(section), list)
            for section in REQUIRED_KEYS):
        return content
    return None


def missing_key(path: str) -> Optional[str]:
    """The first image or annotation of a COCO file without a key a COCO
    dataset needs, named with the file and its id: ``FILE: annotation 5
    (annotations[4]) has no 'image_id'``; None if there is none."""
    content = _load(path)
    if content is None:
        return None
    for section, keys in REQUIRED_KEYS.items():
        for index, record in enumerate(content[section]):
            where = f'{section}[{index}]'
            if not isinstance(record, dict):
                return f'{path}: {where} is not an object'
            missing = [key for key in keys if key not in record]
            if missing:
                if 'id' in record:
                    where = f'{section[:-1]} {record["id"]} ({where})'
                return (f'{path}: {where} has no '
                        f'{", ".join(map(repr, missing))}')
    return None


def dropped_annotations(path: str) -> Optional[DroppedAnnotations]:
    """The annotations of a COCO file whose ``image_id`` names no image;
    None if the file is not COCO-shaped."""
    content = _load(path)
    if content is None:
        return None
    image_ids = {
        image.get('id')
        for image in content['images'] if isinstance(image, dict)
    }
    dropped = [
        ann.get('id') for ann in content['annotations']
        if isinstance(ann, dict) and ann.get('image_id') not in image_ids
    ]
    return DroppedAnnotations(path, len(content['annotations']), dropped)


def format_dropped(report: DroppedAnnotations) -> str:
    """One ``--check`` line: how many annotations were dropped and why."""
    if not report.ids:
        return (f'--check: {report.path}: every one of {report.total} '
                'annotations names an image')
    shown = ', '.join(map(str, report.ids[:_SHOWN_IDS]))
    more = ', ...' if len(report.ids) > _SHOWN_IDS else ''
    return (f'--check: {report.path}: {len(report.ids)} of {report.total} '
            'annotations dropped by the dataset: their image_id names no '
            f'image (ids {shown}{more})')
