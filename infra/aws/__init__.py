"""The AWS stack: one ComponentResource per concern, wired by `infra.aws.stack.build_aws`."""
