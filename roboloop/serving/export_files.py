"""The files of an ONNX export folder (`roboloop export`; `roboloop serve DIR` runs it), for the VLA's export
(serving/export.py) and LeRobot's (serving/export_lerobot.py) alike."""

ONNX_FILE = "model.onnx"
EXPORT_FILE = "export.json"
