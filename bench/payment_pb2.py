"""A team's generated protobuf module, for `bench.input_formats` (FRAUD_INPUT_PROTOBUF_MESSAGE
bench.payment_pb2:Payment): the contract's fields, as simulator/team_shapes.py builds them."""

from simulator.team_shapes import payment_message

Payment = payment_message(1)
