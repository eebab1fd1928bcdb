module github.com/kubemq-io/kubemq-amqp-connector/tests/go

go 1.25

require github.com/Azure/go-amqp v1.7.0
