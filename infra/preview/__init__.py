"""Offline preview: the real program on Pulumi's mock runtime, then policy, cost, diff and reports.

``python -m infra.preview --stack dev`` (see ``__main__``); ``runner.preview`` builds the document.
"""
