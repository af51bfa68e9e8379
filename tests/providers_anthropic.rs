//! The `anthropic` provider against a scripted HTTP server: Messages stream events, the mapping of the OpenAI-shaped history (system apart, tool_use / tool_result, merged user turns), retries, errors and usage.

use std::time::{Duration, Instant};

use bumblehive::config::ProviderConfig;
use bumblehive::protocol::{Event, Message, Role, ToolCall, Usage};
use bumblehive::provider::{
    ModelRequest, ModelResponse, ModelSettings, ProviderError, ProviderEvent,
};
use bumblehive::providers::provider_from_config;
use serde_json::json;

use crate::mock_llm::{MockLlm, MockResponse, anthropic};
use crate::providers_openai::{
    Fixture, TEST_KEY, deltas, generate, of_kind, provider_config, read_file_spec, retries,
    run_events, spawn_generate,
};
use crate::support::{WAIT, assert_message_order};

fn anthropic_config(mock: &MockLlm) -> ProviderConfig {
    provider_config("anthropic", mock.url(), "claude-sonnet-4-5")
}

fn simple_request(text: &str) -> ModelRequest {
    ModelRequest {
        messages: vec![Message::system("S"), Message::user("m", text)].into(),
        tools: Vec::new().into(),
        settings: ModelSettings {
            model: "claude-sonnet-4-5".into(),
            temperature: None,
            max_tokens: None,
            no_images: false,
        },
    }
}

/// A parallel batch of two reads, both answered, then a report that arrived after it.
fn conversation() -> ModelRequest {
    let call = |id: &str, path: &str| ToolCall {
        id: id.into(),
        name: "read_file".into(),
        arguments: json!({"path": path}),
    };
    ModelRequest {
        messages: vec![
            Message::system("You are terse."),
            Message::user("msg-1", "Compare a.txt and b.txt"),
            Message::assistant(
                Some("Reading both.".into()),
                vec![call("toolu_a", "a.txt"), call("toolu_b", "b.txt")],
            ),
            Message::tool("toolu_a", "alpha"),
            Message::tool("toolu_b", "beta"),
            Message::user(
                "subagent:t1",
                "[Background tool result]\nTask ID: t1\n\ndone",
            ),
            Message::assistant(None, vec![call("toolu_c", "c.txt")]),
            Message::tool("toolu_c", ""),
        ]
        .into(),
        tools: vec![read_file_spec()].into(),
        settings: ModelSettings {
            model: "claude-sonnet-4-5".into(),
            temperature: Some(0.7),
            max_tokens: Some(1024),
            no_images: false,
        },
    }
}

#[tokio::test]
async fn anthropic_text_only_streams_and_sends_the_exact_request() {
    let mock = MockLlm::start().await;
    // Byte for byte as the Messages streaming reference shows a text answer.
    mock.push_sse(concat!(
        "event: message_start\n",
        "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-sonnet-4-5-20250929\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n",
        "\n",
        "event: content_block_start\n",
        "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n",
        "\n",
        "event: ping\n",
        "data: {\"type\": \"ping\"}\n",
        "\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n",
        "\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"!\"}}\n",
        "\n",
        "event: content_block_stop\n",
        "data: {\"type\":\"content_block_stop\",\"index\":0}\n",
        "\n",
        "event: message_delta\n",
        "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":15}}\n",
        "\n",
        "event: message_stop\n",
        "data: {\"type\":\"message_stop\"}\n",
        "\n",
    ));
    let provider = provider_from_config(&anthropic_config(&mock)).unwrap();
    let (result, events) = generate(&provider, conversation()).await;
    assert_eq!(deltas(&events), ["Hello", "!"]);
    assert_eq!(
        result.unwrap(),
        ModelResponse {
            content: Some("Hello!".into()),
            tool_calls: vec![],
            finish_reason: Some("stop".into()),
            usage: Some(Usage {
                input_tokens: 25,
                output_tokens: 15
            }),
        }
    );
    let requests = mock.requests();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request.path, "/v1/messages");
    assert_eq!(request.header("x-api-key"), Some(TEST_KEY));
    assert_eq!(request.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(request.header("authorization"), None);
    assert_eq!(request.header("content-type"), Some("application/json"));
    assert_eq!(
        request.body,
        json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 1024,
            "system": "You are terse.",
            "messages": [
                {"role": "user", "content": "Compare a.txt and b.txt"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Reading both."},
                    {"type": "tool_use", "id": "toolu_a", "name": "read_file", "input": {"path": "a.txt"}},
                    {"type": "tool_use", "id": "toolu_b", "name": "read_file", "input": {"path": "b.txt"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_a", "content": "alpha"},
                    {"type": "tool_result", "tool_use_id": "toolu_b", "content": "beta"},
                    {"type": "text", "text": "[Background tool result]\nTask ID: t1\n\ndone"}
                ]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "toolu_c", "name": "read_file", "input": {"path": "c.txt"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_c"}
                ]}
            ],
            "tools": [{
                "name": "read_file",
                "description": "Read a text file.",
                "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
            }],
            "temperature": 0.7,
            "stream": true
        })
    );
}

#[tokio::test]
async fn anthropic_tool_use_split_over_many_chunks() {
    let mock = MockLlm::start().await;
    let input = r#"{"path": "src/lib.rs", "start_line": 3}"#;
    let mut text = anthropic::message_start(472);
    text.push_str(&anthropic::text_start(0));
    text.push_str(&anthropic::text_delta(0, "Okay, let me check."));
    text.push_str(&anthropic::block_stop(0));
    text.push_str(&anthropic::tool_start(
        1,
        "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
        "read_file",
    ));
    text.push_str(&anthropic::input_json(1, ""));
    for c in input.chars() {
        text.push_str(&anthropic::input_json(1, &c.to_string()));
    }
    text.push_str(&anthropic::block_stop(1));
    text.push_str(&anthropic::message_delta("tool_use", 89));
    text.push_str(&anthropic::message_stop());
    let pieces: Vec<Vec<u8>> = text.into_bytes().chunks(29).map(<[u8]>::to_vec).collect();
    mock.push(MockResponse::sse_chunks(pieces));
    let provider = provider_from_config(&anthropic_config(&mock)).unwrap();
    let (result, events) = generate(&provider, simple_request("check")).await;
    let response = result.unwrap();
    assert_eq!(deltas(&events), ["Okay, let me check."]);
    assert_eq!(response.content.as_deref(), Some("Okay, let me check."));
    assert_eq!(response.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(
        response.tool_calls,
        vec![ToolCall {
            id: "toolu_01T1x1fJ34qAmk2tNTrN7Up6".into(),
            name: "read_file".into(),
            arguments: json!({"path": "src/lib.rs", "start_line": 3}),
        }]
    );
    assert_eq!(
        response.usage,
        Some(Usage {
            input_tokens: 472,
            output_tokens: 89
        })
    );
}

#[tokio::test]
async fn anthropic_parallel_tool_use_and_cached_input_tokens() {
    let mock = MockLlm::start().await;
    let start = anthropic::event(
        "message_start",
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5", "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 10, "cache_creation_input_tokens": 200, "cache_read_input_tokens": 3000, "output_tokens": 1}}}),
    );
    let rest = anthropic::tool_answer(
        &[
            ("toolu_a", "read_file", json!({"path": "a.txt"})),
            (
                "toolu_b",
                "sub_agent",
                json!({"title": "T", "task": "do it"}),
            ),
        ],
        0,
        64,
    );
    // Replace the builder's own message_start with the one that has cache counts.
    let rest = rest.split_once("\n\n").unwrap().1.to_string();
    mock.push_sse(start + &anthropic::ping() + &rest);
    let provider = provider_from_config(&anthropic_config(&mock)).unwrap();
    let (result, _) = generate(&provider, simple_request("both")).await;
    let response = result.unwrap();
    assert_eq!(
        response.tool_calls,
        vec![
            ToolCall {
                id: "toolu_a".into(),
                name: "read_file".into(),
                arguments: json!({"path": "a.txt"})
            },
            ToolCall {
                id: "toolu_b".into(),
                name: "sub_agent".into(),
                arguments: json!({"title": "T", "task": "do it"})
            },
        ]
    );
    assert_eq!(
        response.usage,
        Some(Usage {
            input_tokens: 3210,
            output_tokens: 64
        })
    );
}

#[tokio::test]
async fn anthropic_utf8_character_split_across_chunks() {
    let mock = MockLlm::start().await;
    let (response, live) = MockResponse::live();
    mock.push(response);
    let provider = provider_from_config(&anthropic_config(&mock)).unwrap();
    let (task, mut events) = spawn_generate(provider, simple_request("hi"));
    let second = anthropic::text_delta(0, "naïve 🐝");
    let split = second.find('🐝').unwrap() + 2; // inside the bee's four bytes
    let bytes = second.as_bytes();
    live.send(
        anthropic::message_start(3) + &anthropic::text_start(0) + &anthropic::text_delta(0, "A "),
    );
    live.send(bytes[..split].to_vec());
    let first = tokio::time::timeout(WAIT, events.recv()).await.unwrap();
    assert_eq!(first, Some(ProviderEvent::ContentDelta("A ".into())));
    live.send(bytes[split..].to_vec());
    live.send(
        anthropic::block_stop(0)
            + &anthropic::message_delta("end_turn", 4)
            + &anthropic::message_stop(),
    );
    let response = tokio::time::timeout(WAIT, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(response.content.as_deref(), Some("A naïve 🐝"));
}

#[tokio::test]
async fn anthropic_rate_limited_with_retry_after_then_success() {
    let mock = MockLlm::start().await;
    mock.push(
        MockResponse::error(
            429,
            r#"{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}"#,
        )
        .header("retry-after", "1"),
    );
    mock.push_sse(anthropic::text_answer(&["ok"], 5, 1));
    let provider = provider_from_config(&anthropic_config(&mock)).unwrap();
    let started = Instant::now();
    let (result, events) = generate(&provider, simple_request("hi")).await;
    assert_eq!(result.unwrap().content.as_deref(), Some("ok"));
    // Retry-After: 1 is honoured exactly, not replaced by the short configured backoff.
    assert_eq!(retries(&events), [(1, 1000)]);
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert_eq!(mock.requests().len(), 2);
}

#[tokio::test]
async fn anthropic_overloaded_twice_then_success_says_so_in_events() {
    let mock = MockLlm::start().await;
    let overloaded =
        r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
    mock.push(MockResponse::error(529, overloaded));
    mock.push(MockResponse::error(
        500,
        r#"{"type":"error","error":{"type":"api_error","message":"Internal server error"}}"#,
    ));
    mock.push_sse(anthropic::text_answer(&["there ", "you go"], 40, 3));
    let fx = Fixture::new(anthropic_config(&mock));
    let (controller, mut events) = fx.session();
    controller.submit("hello".into(), None).unwrap();
    let (seen, end) = run_events(&mut events, controller.session_id()).await;
    assert_eq!(
        end,
        Event::Result {
            session_id: controller.session_id().into(),
            content: "there you go".into()
        }
    );
    let retries = of_kind(&seen, "provider.retry");
    assert_eq!(retries.len(), 2);
    assert_eq!(
        retries[0]["data"]["reason"],
        "server error 529: Overloaded (HTTP 529)"
    );
    assert_eq!(
        controller.snapshot().usage,
        Usage {
            input_tokens: 40,
            output_tokens: 3
        }
    );
    fx.shutdown().await;
}

#[tokio::test]
async fn anthropic_error_event_before_content_is_retried() {
    let mock = MockLlm::start().await;
    mock.push_sse(
        anthropic::message_start(5) + &anthropic::error("overloaded_error", "Overloaded"),
    );
    mock.push_sse(anthropic::text_answer(&["fine"], 5, 1));
    let provider = provider_from_config(&anthropic_config(&mock)).unwrap();
    let (result, events) = generate(&provider, simple_request("hi")).await;
    assert_eq!(result.unwrap().content.as_deref(), Some("fine"));
    assert_eq!(retries(&events).len(), 1);
}

#[tokio::test]
async fn anthropic_error_event_after_content_is_not_retried() {
    let mock = MockLlm::start().await;
    mock.push_sse(
        anthropic::message_start(5)
            + &anthropic::text_start(0)
            + &anthropic::text_delta(0, "Half an ans")
            + &anthropic::error("overloaded_error", "Overloaded"),
    );
    mock.push_sse(anthropic::text_answer(&["never"], 5, 1));
    let provider = provider_from_config(&anthropic_config(&mock)).unwrap();
    let (result, events) = generate(&provider, simple_request("hi")).await;
    let err = result.unwrap_err();
    assert_eq!(err.to_string(), "server error 529: Overloaded");
    assert!(retries(&events).is_empty());
    assert_eq!(mock.requests().len(), 1);
}

#[tokio::test]
async fn anthropic_truncated_stream_after_content_fails_without_retry() {
    let mock = MockLlm::start().await;
    mock.push(
        MockResponse::sse_chunks([
            anthropic::message_start(5),
            anthropic::text_start(0),
            anthropic::text_delta(0, "The answer"),
        ])
        .then_abort(),
    );
    let provider = provider_from_config(&anthropic_config(&mock)).unwrap();
    let (result, events) = generate(&provider, simple_request("hi")).await;
    let err = result.unwrap_err();
    assert!(matches!(err, ProviderError::Network(_)), "{err:?}");
    assert_eq!(deltas(&events), ["The answer"]);
    assert!(retries(&events).is_empty());
    assert_eq!(mock.requests().len(), 1);
}

#[tokio::test]
async fn anthropic_invalid_json_event_is_a_malformed_response() {
    let mock = MockLlm::start().await;
    mock.push_sse(
        anthropic::message_start(5)
            + "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\n\n",
    );
    let provider = provider_from_config(&anthropic_config(&mock)).unwrap();
    let (result, events) = generate(&provider, simple_request("hi")).await;
    let err = result.unwrap_err();
    assert!(matches!(err, ProviderError::Malformed(_)), "{err:?}");
    assert!(retries(&events).is_empty());
}

#[tokio::test]
async fn anthropic_unauthorized_is_not_retried_and_reads_clearly() {
    let mock = MockLlm::start().await;
    mock.push(MockResponse::error(
        401,
        r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"},"request_id":"req_011CSHoEeqs5C35K2UUqR7Fy"}"#,
    ));
    let fx = Fixture::new(anthropic_config(&mock));
    let (controller, mut events) = fx.session();
    controller.submit("hello".into(), None).unwrap();
    let (seen, end) = run_events(&mut events, controller.session_id()).await;
    assert_eq!(
        end,
        Event::Error {
            session_id: controller.session_id().into(),
            message: "authentication failed: invalid x-api-key (HTTP 401)".into()
        }
    );
    assert!(of_kind(&seen, "provider.retry").is_empty());
    assert_eq!(mock.requests().len(), 1);
    fx.shutdown().await;
}

#[tokio::test]
async fn anthropic_prompt_too_long_is_not_retried() {
    let mock = MockLlm::start().await;
    mock.push(MockResponse::error(
        400,
        r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 208310 tokens > 200000 maximum"}}"#,
    ));
    let provider = provider_from_config(&anthropic_config(&mock)).unwrap();
    let (result, _) = generate(&provider, simple_request("hi")).await;
    let err = result.unwrap_err();
    assert!(matches!(err, ProviderError::ContextTooLong(_)), "{err:?}");
    assert_eq!(
        err.to_string(),
        "the conversation is too long for the model's context: prompt is too long: 208310 tokens > 200000 maximum (HTTP 400)"
    );
    assert_eq!(mock.requests().len(), 1);
}

#[tokio::test]
async fn anthropic_without_a_key_is_a_clear_error_and_sends_nothing() {
    let mock = MockLlm::start().await;
    let mut config = anthropic_config(&mock);
    config.api_key_env = None;
    let provider = provider_from_config(&config).unwrap();
    let (result, _) = generate(&provider, simple_request("hi")).await;
    let message = result.unwrap_err().to_string();
    assert!(
        message.starts_with("authentication failed: no API key configured"),
        "{message}"
    );
    assert!(mock.requests().is_empty());
}

#[tokio::test]
async fn anthropic_tool_run_end_to_end_with_malformed_input() {
    let mock = MockLlm::start().await;
    // A good call and one whose input is not valid JSON, in one message.
    let mut first = anthropic::message_start(300);
    first.push_str(&anthropic::tool_start(0, "toolu_good", "read_file"));
    first.push_str(&anthropic::input_json(0, "{\"path\": \"notes.txt\"}"));
    first.push_str(&anthropic::block_stop(0));
    first.push_str(&anthropic::tool_start(1, "toolu_bad", "read_file"));
    first.push_str(&anthropic::input_json(1, "{\"path\": "));
    first.push_str(&anthropic::block_stop(1));
    first.push_str(&anthropic::message_delta("tool_use", 50));
    first.push_str(&anthropic::message_stop());
    mock.push_sse(first);
    mock.push_sse(anthropic::text_answer(&["Notes say hi."], 420, 6));
    let fx = Fixture::new(anthropic_config(&mock));
    std::fs::write(fx.workspace().join("notes.txt"), "hi").unwrap();
    let (controller, mut events) = fx.session();
    controller.submit("read notes.txt".into(), None).unwrap();
    let (_, end) = run_events(&mut events, controller.session_id()).await;
    assert!(matches!(end, Event::Result { .. }), "{end:?}");
    let history = fx.history(controller.session_id());
    assert_message_order(&history);
    let tools: Vec<&Message> = history.iter().filter(|m| m.role == Role::Tool).collect();
    assert!(tools[0].text().contains("hi"), "{:?}", tools[0]);
    assert!(
        tools[1].text().starts_with("Error: invalid arguments"),
        "{:?}",
        tools[1]
    );
    let second = &mock.bodies()[1];
    let messages = second["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 3);
    assert_eq!(messages[1]["content"][1]["input"], json!({}));
    assert_eq!(messages[2]["role"], "user");
    let results = messages[2]["content"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    assert_eq!(results[0]["tool_use_id"], "toolu_good");
    assert_eq!(results[1]["tool_use_id"], "toolu_bad");
    assert_eq!(
        controller.snapshot().usage,
        Usage {
            input_tokens: 720,
            output_tokens: 56
        }
    );
    fx.shutdown().await;
}
